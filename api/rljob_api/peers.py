"""Settings of verl and TRL by the names their users know, and the RLJob field each one is: what `rljob
validate` suggests when a user writes a peer's name in an RLJob (`rollout.n` is spec.algorithm.groupSize)."""

from __future__ import annotations

# A peer's key (the last part of its path) -> (the RLJob field, whose name it is). Names that RLJob uses too
# in other places (temperature, top_p) are left out: the hint would point at one of them only.
PEER_FIELDS: dict[str, tuple[str, str]] = {
    "n": ("spec.algorithm.groupSize", "verl's actor_rollout_ref.rollout.n"),
    "num_generations": ("spec.algorithm.groupSize", "TRL's num_generations"),
    "train_batch_size": ("spec.algorithm.promptsPerStep", "verl's data.train_batch_size"),
    "max_response_length": ("spec.rollout.sampling.maxNewTokens", "verl's data.max_response_length"),
    "max_completion_length": ("spec.rollout.sampling.maxNewTokens", "TRL's max_completion_length"),
    "kl_loss_coef": ("spec.algorithm.klCoef", "verl's actor.kl_loss_coef"),
    "beta": ("spec.algorithm.klCoef", "TRL's beta"),
    "kl_loss_type": ("spec.algorithm.klEstimator", "verl's actor.kl_loss_type"),
    "lr": ("spec.algorithm.learningRate", "verl's actor.optim.lr"),
    "learning_rate": ("spec.algorithm.learningRate", "TRL's learning_rate"),
    "total_training_steps": ("spec.algorithm.totalSteps", "verl's trainer.total_training_steps"),
    "max_steps": ("spec.algorithm.totalSteps", "TRL's max_steps"),
    "clip_ratio": ("spec.algorithm.clipLow and clipHigh", "verl's actor.clip_ratio"),
    "clip_ratio_low": ("spec.algorithm.clipLow", "verl's actor.clip_ratio_low"),
    "clip_ratio_high": ("spec.algorithm.clipHigh", "verl's actor.clip_ratio_high"),
    "epsilon": ("spec.algorithm.clipLow", "TRL's epsilon"),
    "epsilon_high": ("spec.algorithm.clipHigh", "TRL's epsilon_high"),
    "adv_estimator": ("spec.algorithm.advantageEstimator", "verl's algorithm.adv_estimator"),
    "loss_agg_mode": ("spec.algorithm.lossAggregation", "verl's actor.loss_agg_mode"),
    "loss_type": ("spec.algorithm.lossAggregation", "TRL's loss_type"),
    "scale_rewards": ("spec.algorithm.scaleRewardsByStd", "TRL's scale_rewards"),
    "norm_adv_by_std_in_grpo": ("spec.algorithm.scaleRewardsByStd", "verl's algorithm.norm_adv_by_std_in_grpo"),
    "ppo_mini_batch_size": ("spec.algorithm.miniBatches", "verl's actor.ppo_mini_batch_size (as a count)"),
    "ppo_micro_batch_size_per_gpu": ("spec.trainer.microBatchSize", "verl's actor.ppo_micro_batch_size_per_gpu"),
    "per_device_train_batch_size": ("spec.trainer.microBatchSize", "TRL's per_device_train_batch_size"),
    "grad_clip": ("spec.algorithm.maxGradNorm", "verl's actor.grad_clip"),
    "max_grad_norm": ("spec.algorithm.maxGradNorm", "TRL's max_grad_norm"),
    "weight_decay": ("spec.algorithm.weightDecay", "TRL's weight_decay"),
    "train_files": ("spec.data.path", "verl's data.train_files"),
    "val_files": ("spec.data.eval.path", "verl's data.val_files"),
    "prompt_key": ("spec.data.promptField", "verl's data.prompt_key"),
    "model_name_or_path": ("spec.model.path", "TRL's model_name_or_path"),
    "gpu_memory_utilization": ("spec.rollout.gpuMemoryUtilization", "verl's rollout.gpu_memory_utilization"),
    "tensor_model_parallel_size": ("spec.rollout.gpusPerReplica", "verl's rollout.tensor_model_parallel_size"),
    "n_gpus_per_node": ("spec.trainer.gpusPerNode", "verl's trainer.n_gpus_per_node"),
    "nnodes": ("spec.trainer.nodes", "verl's trainer.nnodes"),
    "save_freq": ("spec.checkpoint.everySteps", "verl's trainer.save_freq"),
    "test_freq": ("spec.data.eval.everySteps", "verl's trainer.test_freq"),
    "ppo_epochs": ("spec.algorithm.updateEpochs", "verl's actor.ppo_epochs"),
    "num_iterations": ("spec.algorithm.updateEpochs", "TRL's num_iterations"),
    "entropy_coeff": ("spec.algorithm.entropyCoef", "verl's actor.entropy_coeff"),
    "lr_warmup_steps": ("spec.algorithm.schedule.warmupSteps", "verl's actor.optim.lr_warmup_steps"),
    "warmup_steps": ("spec.algorithm.schedule.warmupSteps", "TRL's warmup_steps"),
    "warmup_style": ("spec.algorithm.schedule.kind", "verl's actor.optim.warmup_style"),
    "lr_scheduler_type": ("spec.algorithm.schedule.kind", "TRL's lr_scheduler_type"),
    "min_lr_ratio": ("spec.algorithm.schedule.minRatio", "verl's actor.optim.min_lr_ratio"),
}


def peer_hint(key: str) -> str:
    """'; <peer>'s <name> is <field> here' for a peer's key; '' for any other key."""
    found = PEER_FIELDS.get(key)
    if found is None:
        return ""
    field, peer = found
    return f"; {peer} is {field} here"
