"""Part: top. ``python -m gpuprobe.app``: the ``gpuprobe`` command without its console script (top floor)."""

import sys

from gpuprobe.app.cli import main

sys.exit(main())
