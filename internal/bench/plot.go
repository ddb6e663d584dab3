package bench

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Sizes of the matrix plot.
const (
	plotBarWidth   = 11 * vg.Millimeter // the width of one side's bar
	plotGroupGap   = 6 * vg.Millimeter  // space between the cells' groups
	plotPanelH     = 11 * vg.Centimeter // the height of one protocol's panel
	plotMinWidth   = 22 * vg.Centimeter
	plotAxisMargin = 3 * vg.Centimeter // room for the Y axis and its labels
)

// writeMatrixPlot draws the report to path (.svg or .png): a panel per
// protocol, a group of bars per cell, a bar per side (A and B, or the one
// policy, and the peers) at its median, with an error bar from the runs'
// minimum to their maximum.
func writeMatrixPlot(path string, rep *matrixReport) error {
	plots, width, err := matrixPlots(rep)
	if err != nil {
		return err
	}
	if len(plots) == 0 {
		return fmt.Errorf("plot %s: no cell measured", path)
	}
	height := plotPanelH * vg.Length(len(plots))
	var c vg.CanvasSizer
	var wt io.WriterTo
	switch {
	case strings.HasSuffix(path, ".svg"):
		sc := vgsvg.New(width, height)
		c, wt = sc, sc
	case strings.HasSuffix(path, ".png"):
		ic := vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(110))
		c, wt = ic, vgimg.PngCanvas{Canvas: ic}
	default:
		return fmt.Errorf("plot %s: want a .svg or .png file", path)
	}
	dc := draw.New(c)
	// A white background, also for the SVG's viewers with a dark theme.
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadY: 4 * vg.Millimeter, PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 4 * vg.Millimeter}
	grid := make([][]*plot.Plot, len(plots))
	for i, p := range plots {
		grid[i] = []*plot.Plot{p}
	}
	canvases := plot.Align(grid, tiles, dc)
	for i := range grid {
		grid[i][0].Draw(canvases[i][0])
	}
	return writeFile(path, func(w io.Writer) error {
		_, err := wt.WriteTo(w)
		return err
	})
}

// matrixPlots builds one plot per protocol that has measured cells and
// returns them with the canvas width they need.
func matrixPlots(rep *matrixReport) ([]*plot.Plot, vg.Length, error) {
	var plots []*plot.Plot
	maxGroups := 0
	for _, proto := range matrixProtos {
		var cells []*matrixCellResult
		for _, c := range rep.Cells {
			if c.Skip == "" && c.Cell.Proto.Name == proto.Name {
				cells = append(cells, c)
			}
		}
		if len(cells) == 0 {
			continue
		}
		p, err := protoPlot(rep, proto, cells)
		if err != nil {
			return nil, 0, err
		}
		plots = append(plots, p)
		maxGroups = max(maxGroups, len(cells))
	}
	group := plotBarWidth*vg.Length(len(rep.Sides)) + plotGroupGap
	width := max(plotMinWidth, plotAxisMargin+group*vg.Length(maxGroups))
	return plots, width, nil
}

// protoPlot draws one protocol's cells.
func protoPlot(rep *matrixReport, proto matrixProto, cells []*matrixCellResult) (*plot.Plot, error) {
	p := plot.New()
	unit, scale := "Gbit/s", 1e-3 // from Mbit/s
	if proto.UDP {
		unit, scale = "million datagrams/s", 1e-6
	}
	p.Title.Text = fmt.Sprintf("%s: median, bars min-max of %d round(s)", proto.Label, rep.Meta.Rounds)
	if rep.Meta.Congestion != "" && !proto.UDP {
		p.Title.Text += ", sender " + rep.Meta.Congestion
	}
	p.Y.Label.Text = unit
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.Padding = vg.Millimeter
	p.Add(plotter.NewGrid())
	n := len(rep.Sides)
	top := 0.0
	for i, side := range rep.Sides {
		vals := make(plotter.Values, len(cells))
		bars := errBars{off: (vg.Length(i) - vg.Length(n-1)/2) * plotBarWidth, style: plotter.DefaultLineStyle}
		bars.style.Width = vg.Points(1)
		for j, c := range cells {
			s := stats(c.Runs[i])
			vals[j] = s.Med * scale
			top = math.Max(top, s.Hi*scale)
			if s.N > 0 {
				bars.x = append(bars.x, float64(j))
				bars.lo = append(bars.lo, s.Lo*scale)
				bars.hi = append(bars.hi, s.Hi*scale)
			}
		}
		bc, err := plotter.NewBarChart(vals, plotBarWidth)
		if err != nil {
			return nil, err
		}
		bc.Offset = bars.off
		bc.Color = plotutil.Color(i)
		bc.LineStyle.Width = 0
		p.Add(bc, bars)
		p.Legend.Add(sideLegend(rep, side), bc)
	}
	// Headroom above the highest bar for the legend, a line per side.
	p.Y.Max = top * (1.1 + 0.08*float64(n))
	p.NominalX(cellTicks(cells)...)
	// A slot of equal width per cell, its group of bars in the middle.
	p.X.Min, p.X.Max = -0.5, float64(len(cells))-0.5
	p.X.Tick.Label.Rotation = math.Pi / 6
	p.X.Tick.Label.XAlign = draw.XRight
	p.X.Tick.Label.YAlign = draw.YTop
	return p, nil
}

// sideLegend names a side in the legend: A and B with their settings.
func sideLegend(rep *matrixReport, s Side) string {
	switch s.Kind {
	case "stock":
		return "gVisor stock fdbased"
	case "kernel":
		return "kernel over veth"
	}
	if rep.AB {
		return s.Name + ": " + strings.Join(s.Settings, " ")
	}
	if len(rep.Meta.BaseSettings) > 0 {
		return "ustack " + strings.Join(rep.Meta.BaseSettings, " ")
	}
	return "ustack"
}

// cellTicks labels the cells of one protocol by the dimensions that vary
// among them.
func cellTicks(cells []*matrixCellResult) []string {
	vary := func(f func(matrixCell) string) bool {
		for _, c := range cells {
			if f(c.Cell) != f(cells[0].Cell) {
				return true
			}
		}
		return false
	}
	dims := []func(matrixCell) string{
		func(c matrixCell) string { return "core " + c.Core },
		func(c matrixCell) string { return fmt.Sprintf("MTU %d", c.MTU) },
		func(c matrixCell) string { return "LRO " + c.LRO },
		func(c matrixCell) string { return "tunnel " + c.Tunnel },
	}
	var use []func(matrixCell) string
	for _, d := range dims {
		if vary(d) {
			use = append(use, d)
		}
	}
	if len(use) == 0 {
		use = dims[1:2]
	}
	out := make([]string, len(cells))
	for i, c := range cells {
		var parts []string
		for _, d := range use {
			parts = append(parts, d(c.Cell))
		}
		out[i] = strings.Join(parts, ", ")
	}
	return out
}

// errBars draws vertical error bars from lo to hi at the categories x,
// shifted by off on the canvas as the bars they belong to are.
type errBars struct {
	x, lo, hi []float64
	off       vg.Length
	style     draw.LineStyle
}

// Plot implements plot.Plotter.
func (e errBars) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	capW := plotBarWidth / 5
	for i := range e.x {
		x := trX(e.x[i]) + e.off
		lo, hi := trY(e.lo[i]), trY(e.hi[i])
		c.StrokeLine2(e.style, x, lo, x, hi)
		c.StrokeLine2(e.style, x-capW, lo, x+capW, lo)
		c.StrokeLine2(e.style, x-capW, hi, x+capW, hi)
	}
}

// DataRange implements plot.DataRanger, so that the Y axis takes in the
// highest bar.
func (e errBars) DataRange() (xmin, xmax, ymin, ymax float64) {
	if len(e.x) == 0 {
		return 0, 0, 0, 0
	}
	xmin, xmax, ymin, ymax = math.Inf(1), math.Inf(-1), 0, math.Inf(-1)
	for i := range e.x {
		xmin, xmax = math.Min(xmin, e.x[i]), math.Max(xmax, e.x[i])
		ymax = math.Max(ymax, e.hi[i])
	}
	return xmin, xmax, ymin, ymax
}
