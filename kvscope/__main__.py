import sys

from kvscope.cli import main

sys.exit(main())
