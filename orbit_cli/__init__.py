"""The ``orbit`` command line: daemons, migrations, administration and the local stack."""
