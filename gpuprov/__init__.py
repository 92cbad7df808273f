"""gpuprov: turn bare GPU servers into validated deep-learning hosts."""

__version__ = "0.1.0"
