"""tiered"""
