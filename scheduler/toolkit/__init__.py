"""The CLI's output contract (``cli_output``), below the CLI so that plugin commands can share it.

What plugins share lives in the ``scheduler-toolkit`` distribution (``scheduler_toolkit``);
this package keeps only what the kernel's own CLI needs and the toolkit re-exports.
"""
