"""Experiments on the method, outside the library (not in the wheel): the small-scale
reproduction of the paper (`paper.py`), the Fashion-MNIST study (`study.py`), the
resumable runs both are made of (`runs.py`), their pictures (`plots.py`), and the
measurements the docs quote (`benchmark.py`, `train_throughput.py`).

Run from the repository's root with `python -m experiments.<name> --help`; the
reproduction's command line is `python -m experiments.reproduce`."""
