"""The reward pool: rule reward functions, the RewardService server, the serve-a-function helper and the router."""

from .functions import RewardConfigError, RewardFunctionSet, WeightedFunction, load_function
from .router import NoReplicaError, ReplicaUnavailableError, RewardRouter, RouterStats
from .server import RewardServicer, is_refusal, serve_function, serve_reward, start_reward_server

__all__ = [
    "NoReplicaError",
    "ReplicaUnavailableError",
    "RewardConfigError",
    "RewardFunctionSet",
    "RewardRouter",
    "RewardServicer",
    "RouterStats",
    "WeightedFunction",
    "is_refusal",
    "load_function",
    "serve_function",
    "serve_reward",
    "start_reward_server",
]
