from .api import Policy
class GmuxPolicy(Policy):
    name = "gmux"
