import sys

from gpuprobe.cli import main

sys.exit(main())
