import sys

from gradcomp.cli import main

sys.exit(main())
