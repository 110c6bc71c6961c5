"""The driver's client of the reward pool: one Score stream per replica, least-outstanding routing."""
