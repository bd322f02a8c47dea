import sys

from nriplugin.cli.main import main

sys.exit(main())
