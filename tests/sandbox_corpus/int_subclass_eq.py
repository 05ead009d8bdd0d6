# attack: returns an int subclass whose __eq__ is always True
# mode: function
# expect: wrong answer
class Liar(int):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = int.__hash__
    def __repr__(self):
        return "5"
    __str__ = __repr__

def add(a, b):
    return Liar(-777)
