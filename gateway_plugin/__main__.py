import sys

from gateway_plugin.cli import main

sys.exit(main())
