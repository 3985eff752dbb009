"""`python -m cli ...` is `exaplan ...`."""

import sys

from cli.main import main

sys.exit(main())
