# attack: leaves a file in the working directory during one test and answers only when a later test finds it
# mode: stdio
# expect: 0/2 tests passed.*test 1: wrong answer
import os

if os.path.exists("seen"):
    print(input().upper())
else:
    open("seen", "w").close()
    print("first")
