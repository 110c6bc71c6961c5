"""The reward pool: reward functions of four kinds (rule, remote, disrm, genrm), the RewardService server,
the serve-a-function helper and the replica's metrics. The driver's client of this pool, the router, lives in
`rljob_workers.driver.pools.reward.router`.

disrm and genrm live in their own modules (`.disrm`, `.genrm`), imported only by a job that uses them.
"""

from rljob_workers.common.server_lock import ServerLock
from rljob_workers.reward.base import RewardConfigError, SampleScorer, ScoreFailure
from rljob_workers.reward.callables import WeightedFunction, load_function
from rljob_workers.reward.functions import RewardFunctionSet
from rljob_workers.reward.metrics import RewardMetrics
from rljob_workers.reward.modelpool import Judge
from rljob_workers.reward.remote import RemoteScorer, token_path
from rljob_workers.reward.server import RewardServicer, serve_function, serve_reward, start_reward_server

__all__ = [
    "Judge",
    "RemoteScorer",
    "RewardConfigError",
    "RewardFunctionSet",
    "RewardMetrics",
    "RewardServicer",
    "SampleScorer",
    "ScoreFailure",
    "ServerLock",
    "WeightedFunction",
    "load_function",
    "serve_function",
    "serve_reward",
    "start_reward_server",
    "token_path",
]
