import sys

from functions.cli import main

sys.exit(main())
