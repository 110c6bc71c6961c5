"""Local model generators for tests and development, needing no download."""
