"""The rollout pool's replica: inference engines behind one protocol, and the RolloutService server."""
