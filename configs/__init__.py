"""The config kernel: what a typed, composed config is, read as flat settings (:mod:`configs.fields`),
and the numeric ranges its fields declare (:mod:`configs.ranges`).

It imports no other package of the project; every other package may import it.
"""
