"""Experiments on the method, outside the library's core: the small-scale reproduction of
the paper (`reproduce.py`), the Fashion-MNIST study (`study.py`), the resumable runs both
are made of (`runs.py`) and their pictures (`plots.py`). Nothing in the core imports them;
they live in the package so that their process pool's workers can import them."""
