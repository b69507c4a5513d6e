"""The command line: the ``bytedistill`` router and one thin module per subcommand over the library.

Nothing in ``bytestream``, ``distill``, ``logit_store`` or ``students`` imports this package.
"""
