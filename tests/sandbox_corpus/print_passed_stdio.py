# attack: prints success messages instead of the answer
# mode: stdio
# expect: wrong answer
print("passed")
print("OK")
