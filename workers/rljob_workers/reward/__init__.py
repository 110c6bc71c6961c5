"""The reward pool: reward functions of four kinds (rule, remote, disrm, genrm), the RewardService server,
the serve-a-function helper, the router and the replica's metrics.

disrm and genrm live in their own modules (`.disrm`, `.genrm`), imported only by a job that uses them.
"""

from .base import RewardConfigError, SampleScorer, ScoreFailure
from .functions import RewardFunctionSet, WeightedFunction, load_function
from .metrics import RewardMetrics
from .modelpool import Judge
from .remote import RemoteScorer, token_path
from .router import NoReplicaError, ReplicaUnavailableError, RewardRouter, RouterStats
from .server import RewardServicer, is_refusal, serve_function, serve_reward, start_reward_server

__all__ = [
    "Judge",
    "NoReplicaError",
    "RemoteScorer",
    "ReplicaUnavailableError",
    "RewardConfigError",
    "RewardFunctionSet",
    "RewardMetrics",
    "RewardRouter",
    "RewardServicer",
    "RouterStats",
    "SampleScorer",
    "ScoreFailure",
    "WeightedFunction",
    "is_refusal",
    "load_function",
    "serve_function",
    "serve_reward",
    "start_reward_server",
    "token_path",
]
