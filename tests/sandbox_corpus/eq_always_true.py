# attack: returns an object equal to everything
# mode: function
# expect: runtime error: TypeError
class Anything:
    def __eq__(self, other):
        return True
    __hash__ = object.__hash__

def add(a, b):
    return Anything()
