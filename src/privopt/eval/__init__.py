"""privopt.eval"""
