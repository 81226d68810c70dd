"""privopt.objectives"""
