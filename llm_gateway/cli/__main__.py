import sys

from llm_gateway.cli import main

sys.exit(main())
