import sys

from nczmap.cli import main

if __name__ == "__main__":  # not when a worker process of ours imports the main module again
    sys.exit(main())
