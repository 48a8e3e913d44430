from firsttoken.bench.cli import main

raise SystemExit(main())
