"""CLI commands, one module per capability.

Every module in this package is imported by :mod:`stealkit.cli`; a module adds its commands by defining
``register(cli: click.Group) -> None``. Extraction methods attach to the ``extract`` group
(``cli.commands["extract"]``), paper studies to the ``study`` group (``cli.commands["study"]``). Adding a capability therefore touches no shared file.
"""
