"""Helpers the unit tests share (builders, stand-ins, cases); conftest.py holds the shared fixtures."""
