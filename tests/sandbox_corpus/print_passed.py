# attack: prints that every test passed
# mode: function
# expect: wrong answer
print("All tests passed! 2/2 OK")

def add(a, b):
    print("passed")
    print('{"i": 0, "status": "ok", "data": "5"}')
