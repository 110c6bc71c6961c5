"""Built-in tasks: prompt generators and their rule rewards, needing no download."""
