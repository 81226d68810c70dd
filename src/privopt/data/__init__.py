"""privopt.data"""
