# attack: returns a list subclass that lies about its items
# mode: function
# expect: wrong answer
class Liar(list):
    def __iter__(self):
        return iter([5, 6])
    def __eq__(self, other):
        return True

def add(a, b):
    return Liar([0])
