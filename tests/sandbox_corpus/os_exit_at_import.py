# attack: os._exit(0) before any test runs
# mode: function
# expect: exited early \(no result reported\)
import os
os._exit(0)
