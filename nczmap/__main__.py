import sys

from nczmap.cli import main

sys.exit(main())
