"""Training math and loops: losses, advantages, log-probs."""
