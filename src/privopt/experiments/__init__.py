"""privopt.experiments"""
