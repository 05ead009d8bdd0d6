# attack: exits 0 without output (stdin/stdout problem)
# mode: stdio
# expect: wrong answer
import sys
sys.exit(0)
