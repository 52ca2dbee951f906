"""The ``scheduler`` command line (click). Sub-command modules are imported lazily."""
