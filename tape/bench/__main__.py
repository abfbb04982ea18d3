import sys

from tape.bench.cli import main

sys.exit(main())
