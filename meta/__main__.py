import sys

from meta.cli import main

sys.exit(main())
