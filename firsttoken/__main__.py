from firsttoken.cli import main

raise SystemExit(main())
