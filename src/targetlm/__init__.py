"""targetlm: language models whose output side is a first-class, swappable part."""

__version__ = "0.1.0"
