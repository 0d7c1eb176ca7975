"""The ``tcircuits`` subcommands of numeric_check (``verify``, ``train-toy``, ``analyze``), each a
``register(subparsers)`` function found through the ``tcircuits.commands`` entry points.
"""
