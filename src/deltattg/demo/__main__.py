from deltattg.demo.cli import main

raise SystemExit(main())
