"""privopt.privacy"""
