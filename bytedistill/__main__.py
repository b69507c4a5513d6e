"""``python -m bytedistill CMD ...`` (and ``accelerate launch -m bytedistill CMD ...``): the command line."""

import sys

from bytedistill.cli import main

sys.exit(main())
