"""Fake and deliberately broken targets, models and servers the tests run against.

Each module is loadable by worker processes as ``py:tests.fakes.<module>:<factory>``.
"""
