# attack: floods stdout (a stdin/stdout problem)
# mode: stdio
# expect: output limit
import sys
while True:
    sys.stdout.write("A" * 65536)
