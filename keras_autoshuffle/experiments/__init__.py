"""Experiments on the method, outside the library's core: the small-scale reproduction of
the paper (`reproduce.py`) and its pictures (`plots.py`). Nothing in the core imports
them; they live in the package so that their process pool's workers can import them."""
