"""privopt.models"""
