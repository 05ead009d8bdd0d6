# attack: returns a float within a relative 1e-6 of the integer answer instead of the integer
# mode: function
# expect: wrong answer
def add(a, b):
    return (a + b) * (1 + 5e-7)
