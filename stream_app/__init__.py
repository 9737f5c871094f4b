"""threes."""
