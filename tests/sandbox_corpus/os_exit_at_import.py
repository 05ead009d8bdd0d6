# attack: os._exit(0) before any test runs
# mode: function
# expect: not run
import os
os._exit(0)
